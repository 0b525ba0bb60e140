"""The rules DeepSpeed does not enforce itself; `lint.lint` runs them (the full rule list is in its docstring).

Each rule takes the parsed config (and what it needs of the `LintContext`) and returns a list of `Problem`s.
"""

from __future__ import annotations

import math
from typing import Any

from zero_kit.lint.discover import discover, dtype_names, hf_trainer_auto_keys
from zero_kit.lint.problem import BATCH_KEYS, ROOT, LintContext, Problem, Target, did_you_mean, is_number, join, lookup


def auto_rules(autos: list[str], dropped: dict[str, Any], target: Target) -> list[Problem]:
    """ "auto" is a placeholder that only the HF Trainer (and accelerate) fill, and only at certain keys."""
    # transformers is imported only when some "auto" needs judging (it costs seconds).
    filled = hf_trainer_auto_keys() if autos and target != "deepspeed" else frozenset()
    problems = []
    for path in autos:
        if target == "deepspeed":
            message = '"auto" is filled only by the HF Trainer or accelerate; plain deepspeed.initialize cannot use it'
            fix = "write a value, or validate with --for hf-trainer if the HF Trainer launches this config"
            problems.append(Problem("error", path, "auto", message, fix))
        elif target == "accelerate" and path in BATCH_KEYS:
            message = "accelerate fills the batch itself and then fails DeepSpeed's batch assertion at world size > 1"
            fix = "write the numbers (train_batch_size = micro x grad_accum x world size) and pass the file with --deepspeed_config_file"
            problems.append(Problem("error", path, "auto", message, fix))
        elif path in filled:
            continue
        elif path in dropped:
            message = f'the {target} integration does not fill "auto" here; DeepSpeed drops it and uses its default ({dropped[path]!r})'
            problems.append(
                Problem(
                    "warning", path, "auto", message, "write a value, or remove the key to say you want the default"
                )
            )
        else:
            message = f'the {target} integration does not fill "auto" here, so DeepSpeed would get the string "auto"'
            fix = f'write a value; "auto" is filled only at: {", ".join(sorted(filled))}'
            problems.append(Problem("error", path, "auto", message, fix))
    return problems


def non_finite(node: Any, path: str) -> list[Problem]:
    """NaN and Infinity parse in Python but are not JSON and never a sensible setting."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in non_finite(v, join(path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in non_finite(v, join(path, i))]
    if isinstance(node, float) and not math.isfinite(node):
        return [Problem("error", path or ROOT, str(node), "NaN/Infinity is not valid JSON", "write a finite number")]
    return []


def _batch_values(config: dict) -> tuple[dict[str, int], list[Problem]]:
    """The batch keys that hold usable whole numbers; problems for the ones that hold bad numbers."""
    values, problems = {}, []
    for key in BATCH_KEYS:
        value = config.get(key)
        if value is None or value == "auto":
            continue  # absent, or auto (see the auto rules)
        if isinstance(value, (str, bool, dict, list)):
            kind = "a string" if isinstance(value, str) else type(value).__name__
            fix = (
                f"write {value} without quotes"
                if isinstance(value, str) and value.strip().isdigit()
                else f"set {key} to a positive integer"
            )
            problems.append(Problem("error", key, value, f"expected a whole number > 0, found {kind}", fix))
        elif not isinstance(value, int) or value <= 0:
            problems.append(
                Problem(
                    "error",
                    key,
                    value,
                    f"{key} must be a whole number > 0",
                    f"set {key} to a positive integer such as 1",
                )
            )
        else:
            values[key] = value
    return values, problems


def batch_rules(config: dict, context: LintContext) -> tuple[list[Problem], int]:
    """train_batch_size = micro x grad_accum x world size, checked with the real world size.
    Returns the problems and the world size to give DeepSpeed's own parse."""
    values, problems = _batch_values(config)
    tbs = values.get("train_batch_size")
    micro = values.get("train_micro_batch_size_per_gpu")
    accum = values.get("gradient_accumulation_steps")
    autos = [k for k in BATCH_KEYS if config.get(k) == "auto"]
    if problems or autos:
        return problems, context.world_size or 1
    if tbs is None and micro is None:
        return [
            Problem(
                "error",
                "train_batch_size",
                None,
                "neither train_batch_size nor train_micro_batch_size_per_gpu is set",
                "set train_micro_batch_size_per_gpu (and gradient_accumulation_steps)",
            )
        ], 1
    world, source = context.world_size, context.world_size_source
    # DeepSpeed divides the world by sequence_parallel_size to get the data-parallel size the batch uses.
    sp = config.get("sequence_parallel_size")
    sp = sp if isinstance(sp, int) and not isinstance(sp, bool) and sp > 0 else 1
    if world is not None and world % sp:
        message = f"world size {world} ({source}) is not divisible by sequence_parallel_size({sp})"
        return [
            Problem(
                "error", "sequence_parallel_size", sp, message, f"use a sequence_parallel_size that divides {world}"
            )
        ], world
    if world is not None and sp > 1:
        world, source = world // sp, f"{source} / sequence_parallel_size {sp}"
    if world is None and context.target == "accelerate":
        problems.append(
            Problem(
                "warning",
                "train_batch_size",
                config.get("train_batch_size"),
                "accelerate checks the batch triple against the real world size, which is unknown here",
                "pass --world-size N (or set WORLD_SIZE) to check it before launch",
            )
        )
    if world is None and tbs and micro and accum and tbs % (micro * accum) == 0:
        world, source = tbs // (micro * accum), "implied by the batch triple"
    if world is None:
        world, source = 1, "assumed: pass --world-size or set WORLD_SIZE"
    return problems + _batch_arithmetic(tbs, micro, accum, world, source), world * sp


def _batch_arithmetic(tbs: int | None, micro: int | None, accum: int | None, world: int, source: str) -> list[Problem]:
    shown = f"world_size({world}, {source})"
    if tbs is None:
        return []  # DeepSpeed derives train_batch_size from the other two
    if micro and accum:
        if tbs == micro * accum * world:
            return []
        message = f"train_batch_size({tbs}) != micro({micro}) * grad_accum({accum}) * {shown}"
        return [
            Problem(
                "error",
                "train_batch_size",
                tbs,
                message,
                f"set train_batch_size to {micro * accum * world} or leave it out",
            )
        ]
    per_step = (micro or accum or 1) * world
    if tbs % per_step == 0:
        return []
    given = f"micro({micro}) * " if micro else f"grad_accum({accum}) * " if accum else ""
    message = (
        f"train_batch_size({tbs}) is not divisible by {given}{shown}: DeepSpeed would round the other batch key down"
    )
    fix = f"set train_batch_size to a multiple of {per_step} (e.g. {max(per_step, tbs - tbs % per_step)}) or set all three batch keys"
    return [Problem("error", "train_batch_size", tbs, message, fix)]


def _enabled(config: dict, section: str) -> Any:
    node = config.get(section)
    return node.get("enabled") if isinstance(node, dict) else None


def precision_rules(config: dict) -> list[Problem]:
    bf16_key = "bf16" if "bf16" in config or "bfloat16" not in config else "bfloat16"
    if _enabled(config, "fp16") is True and _enabled(config, bf16_key) is True:
        return [
            Problem(
                "error",
                f"{bf16_key}.enabled",
                True,
                "fp16 and bf16 are both enabled; DeepSpeed refuses this",
                "enable one: bf16 on Ampere or newer GPUs, fp16 on older ones",
            )
        ]
    return []


def _device(config: dict, which: str) -> Any:
    return lookup(config, f"zero_optimization.{which}.device")


def zero_rules(config: dict, target: Target) -> list[Problem]:
    """Offload and stage combinations DeepSpeed accepts silently but that do not do what the user meant."""
    zero = config.get("zero_optimization")
    if target == "accelerate" and zero is None:
        return [
            Problem(
                "error",
                "zero_optimization",
                None,
                "accelerate refuses a DeepSpeed config without zero_optimization",
                'add "zero_optimization": {"stage": N}',
            )
        ]
    if not isinstance(zero, dict):
        return []
    stage = zero.get("stage", 0)
    stage = stage if isinstance(stage, int) and not isinstance(stage, bool) else None
    problems = []
    param_dev, optim_dev = _device(config, "offload_param"), _device(config, "offload_optimizer")
    if stage is not None and stage < 3 and param_dev in ("cpu", "nvme"):
        problems.append(
            Problem(
                "error",
                "zero_optimization.offload_param.device",
                param_dev,
                f"parameter offload needs ZeRO stage 3 (stage is {stage}); DeepSpeed would ignore it",
                'set zero_optimization.stage to 3 or offload_param.device to "none"',
            )
        )
    if stage == 0 and optim_dev in ("cpu", "nvme"):
        problems.append(
            Problem(
                "error",
                "zero_optimization.offload_optimizer.device",
                optim_dev,
                "optimizer offload needs ZeRO stage 1 or higher (stage is 0)",
                'set zero_optimization.stage to 1, 2 or 3, or offload_optimizer.device to "none"',
            )
        )
    if stage is not None and 0 < stage < 3 and optim_dev == "nvme":
        problems.append(
            Problem(
                "error",
                "zero_optimization.offload_optimizer.device",
                optim_dev,
                f"NVMe optimizer offload needs ZeRO stage 3 (stage is {stage})",
                'use "cpu" at this stage, or set zero_optimization.stage to 3',
            )
        )
    for which, device in (("offload_param", param_dev), ("offload_optimizer", optim_dev)):
        if device == "nvme" and not lookup(config, f"zero_optimization.{which}.nvme_path"):
            problems.append(
                Problem(
                    "error",
                    f"zero_optimization.{which}.nvme_path",
                    None,
                    f"{which} to NVMe needs nvme_path",
                    f'add "nvme_path": "/local_nvme" under zero_optimization.{which}',
                )
            )
    problems += _stage3_rules(zero, stage, target)
    problems += _client_optimizer_rule(config, optim_dev, target)
    return problems


def _client_optimizer_rule(config: dict, optim_dev: Any, target: Target) -> list[Problem]:
    """With optimizer offload and no optimizer section, the script's own optimizer is used; DeepSpeed raises
    ZeRORuntimeException unless it is DeepSpeedCPUAdam (accelerate, and so the HF Trainer, swap it in themselves)."""
    if target != "deepspeed" or optim_dev not in ("cpu", "nvme") or "optimizer" in config:
        return []
    if config.get("zero_force_ds_cpu_optimizer", True) is False:
        return []
    return [
        Problem(
            "warning",
            "optimizer",
            None,
            "optimizer offload with the script's own optimizer: deepspeed.initialize raises unless it is DeepSpeedCPUAdam",
            'add an "optimizer" section (e.g. {"type": "AdamW", "params": {...}}), pass DeepSpeedCPUAdam, '
            'or set "zero_force_ds_cpu_optimizer": false',
        )
    ]


def _stage3_rules(zero: dict, stage: int | None, target: Target) -> list[Problem]:
    gather_keys = (
        "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
    )
    problems = []
    if stage == 3 and target != "deepspeed" and not any(zero.get(k) is True for k in gather_keys):
        problems.append(
            Problem(
                "warning",
                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                zero.get(gather_keys[0]),
                "at stage 3 the HF Trainer saves empty weights unless DeepSpeed gathers them on save",
                'set "stage3_gather_16bit_weights_on_model_save": true',
            )
        )
    if stage is not None and stage < 3:
        for key, value in zero.items():
            if isinstance(key, str) and key.startswith("stage3_") and value not in (None, "auto"):
                problems.append(
                    Problem(
                        "warning",
                        f"zero_optimization.{key}",
                        value,
                        f"stage-3 setting has no effect at stage {stage}",
                        "remove it, or set zero_optimization.stage to 3",
                    )
                )
    return problems


def scheduler_rules(config: dict) -> list[Problem]:
    params = lookup(config, "scheduler.params")
    if not isinstance(params, dict):
        return []
    warmup, total = params.get("warmup_num_steps"), params.get("total_num_steps")
    problems = []
    if is_number(warmup) and warmup <= 0:
        problems.append(
            Problem(
                "error",
                "scheduler.params.warmup_num_steps",
                warmup,
                "DeepSpeed >= 0.19.6 rejects warmup_num_steps <= 0",
                "set warmup_num_steps to 1 or more",
            )
        )
    elif is_number(warmup) and is_number(total) and total < warmup:
        problems.append(
            Problem(
                "error",
                "scheduler.params.total_num_steps",
                total,
                f"total_num_steps({total}) < warmup_num_steps({warmup}): the decay never starts",
                f"set total_num_steps to at least {warmup}",
            )
        )
    return problems


def dtype_rules(config: dict) -> list[Problem]:
    """data_types.*_dtype are resolved only when the engine starts (DtypeEnum), so DeepSpeed's parse accepts typos."""
    section = config.get("data_types")
    if not isinstance(section, dict):
        return []
    problems = []
    for key in (k for k in discover().keys.get("data_types", {}) if k.endswith("_dtype")):
        value = section.get(key)
        if value is not None and value != "auto" and value not in dtype_names():
            fix = did_you_mean(value, dtype_names()) if isinstance(value, str) else 'use "bf16", "fp16" or "fp32"'
            problems.append(Problem("error", f"data_types.{key}", value, "not a dtype DeepSpeed knows", fix))
    return problems
