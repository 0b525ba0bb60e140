"""The batch rules: train_batch_size = micro x grad_accum x world size at the real world size, the batch keys'
values, and what the HF Trainer and accelerate do with batch keys (filled "auto", hard-coded numbers)."""

from __future__ import annotations

from zero_kit.lint.problem import BATCH_KEYS, LintContext, Problem


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


# What the HF Trainer compares each batch key with (trainer_config_process fills "auto" and fill_match records any
# other value that differs; trainer_config_finalize then raises ValueError listing the mismatches).
_TRAINER_ARGUMENTS = {
    "train_batch_size": "per_device_train_batch_size x gradient_accumulation_steps x world size",
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
}


def integration_batch_rules(config: dict, context: LintContext) -> list[Problem]:
    """Batch keys that work or fail depending on what the HF Trainer or accelerate bring at run time."""
    if context.target == "accelerate":
        return _accelerate_auto_batch(config, context) + zero3_init_batch(config, context)
    if context.target == "hf-trainer" and context.trainer_args is not None:
        return zero3_init_batch(config, context)  # rules_trainer compares the batch keys with the script's arguments
    if context.target == "hf-trainer":
        return _trainer_hard_coded_batch(config, context) + zero3_init_batch(config, context)
    return []


def zero3_init_batch(config: dict, context: LintContext) -> list[Problem]:
    """Under ZeRO-3, transformers' from_pretrained builds the model inside deepspeed.zero.Init, which parses the
    config with DeepSpeed's own DeepSpeedConfig. Where DeepSpeed's communication is not up yet (CPU ranks: accelerate
    brings up torch.distributed, not deepspeed.comm), that parse counts one rank, so any train_batch_size written for
    more ranks ("auto" as the Trainer fills it, or a number) fails its batch check. Reproduced in
    tests/dist/test_hf_zero3_batch_key.py. accelerate drops an "auto" one itself before zero.Init."""
    value = config.get("train_batch_size")
    zero = config.get("zero_optimization")
    if value is None or not isinstance(zero, dict) or zero.get("stage") != 3 or context.world_size == 1:
        return []
    if context.target == "accelerate" and value == "auto":
        return []
    message = (
        "at ZeRO-3, from_pretrained builds the model inside deepspeed.zero.Init, which reads this config before"
        " DeepSpeed's communication is up on CPU ranks and counts one rank: train_batch_size then fails DeepSpeed's"
        " batch check (train_batch_size != micro * grad_accum * 1). GPU runs bring it up first and work"
    )
    fix = "remove train_batch_size (DeepSpeed derives it: micro x grad_accum x world size)"
    # A user's own script on CPU ranks (script arguments given): it builds the model first, so this fails for sure.
    severity = "error" if context.trainer_args is not None and context.device == "cpu" else "warning"
    return [Problem(severity, "train_batch_size", value, message, fix)]


def _accelerate_auto_batch(config: dict, context: LintContext) -> list[Problem]:
    """accelerate fills "auto" train_batch_size with micro x accum x its own process count. With a distributed
    backend (every GPU host) that count is the world size; on a CPU-only host accelerate has no backend and counts
    1, while DeepSpeed counts every rank, so its batch assertion fails (reproduced in test_lint_upstream.py)."""
    world = context.world_size
    if config.get("train_batch_size") != "auto" or world == 1:
        return []
    ranks = f"{world} processes ({context.world_size_source})" if world else "more than one process"
    message = (
        f'accelerate fills "auto" here with micro x grad_accum x its process count, which is 1 on a CPU-only host'
        f" (no GPU, so no distributed backend): with {ranks} DeepSpeed's batch assertion then fails at start-up."
        " On GPU hosts accelerate counts every process and this works"
    )
    fix = "leave train_batch_size out (DeepSpeed derives it) or write the number (micro x grad_accum x world size)"
    return [Problem("warning", "train_batch_size", "auto", message, fix)]


def _trainer_hard_coded_batch(config: dict, context: LintContext) -> list[Problem]:
    world = f"world size ({context.world_size})" if context.world_size else "world size"
    problems = []
    for key, arguments in _TRAINER_ARGUMENTS.items():
        value = config.get(key)
        if value is None or value == "auto":
            continue
        message = (
            f"the HF Trainer requires {key} to equal its TrainingArguments {arguments.replace('world size', world)};"
            " otherwise Trainer start-up fails with 'Please correct the following DeepSpeed config values that mismatch"
            " TrainingArguments values'"
        )
        fix = f'write "auto" (the Trainer fills it from its arguments) or pass TrainingArguments that give {value}'
        problems.append(Problem("warning", key, value, message, fix))
    return problems
