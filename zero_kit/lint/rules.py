"""The rules DeepSpeed does not enforce itself; `lint.lint` runs them (the full rule list is in its docstring).

Each rule takes the parsed config (and what it needs of the `LintContext`) and returns a list of `Problem`s.
"""

from __future__ import annotations

import math
from typing import Any

from zero_kit.lint.problem import ROOT, Problem, Target, did_you_mean, is_number, join, lookup


def auto_rules(autos: list[str], dropped: dict[str, Any], target: Target) -> list[Problem]:
    """ "auto" is a placeholder that only the HF Trainer (and accelerate) fill, and only at certain keys."""
    from zero_kit.lint.discover import hf_trainer_auto_keys  # `lint`'s rule only: `check_rules` reads no DeepSpeed

    # transformers is imported only when some "auto" needs judging (it costs seconds).
    filled = hf_trainer_auto_keys() if autos and target != "deepspeed" else frozenset()
    problems = []
    for path in autos:
        if target == "deepspeed":
            message = '"auto" is filled only by the HF Trainer or accelerate; plain deepspeed.initialize cannot use it'
            fix = "write a value, or validate with --for hf-trainer if the HF Trainer launches this config"
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
    from zero_kit.lint.discover import discover  # `lint`'s rule only: `check_rules` reads no DeepSpeed
    from zero_kit.lint.installed import dtype_names

    problems = []
    for key in (k for k in discover().keys.get("data_types", {}) if k.endswith("_dtype")):
        value = section.get(key)
        if value is not None and value != "auto" and value not in dtype_names():
            fix = did_you_mean(value, dtype_names()) if isinstance(value, str) else 'use "bf16", "fp16" or "fp32"'
            problems.append(Problem("error", f"data_types.{key}", value, "not a dtype DeepSpeed knows", fix))
    return problems
