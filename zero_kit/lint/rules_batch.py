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
