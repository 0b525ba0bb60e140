"""Lint a DeepSpeed config before a GPU hour is spent on it.

`lint(config, context)` is pure: no printing, no exit, no environment reads. It checks the config
against DeepSpeed's own schema (pydantic models and the keys its parser reads, see `ds_schema`),
adds the rules DeepSpeed does not enforce (misspelt keys, numbers written as strings, "auto" where
nobody fills it, batch arithmetic at the real world size, contradictory offload/precision), and
finally runs DeepSpeed's own parse so that whatever passes here also passes there.

Rules (E: error, W: warning):
- E unknown key inside a section DeepSpeed validates (pydantic models, optimizer/scheduler params checked
  against the signature of the class DeepSpeed builds), with "did you mean"; E misspelling (<= 2 edits or case)
  of a real key where DeepSpeed silently ignores it (top level, activation_checkpointing, aio, ...); W other
  ignored keys (e.g. LLaMA-Factory's comms_config); "_comment"-style keys are left alone.
- E wrong JSON type, incl. numbers/booleans written as strings ("8", "true") that pydantic would coerce.
- E keys of removed DeepSpeed features (DeepSpeed's own message); W deprecated keys, with the new name.
- E "auto" with --for deepspeed (except where DeepSpeed's own default is "auto"); with hf-trainer/accelerate
  E "auto" where the HF Trainer does not fill it (list read off transformers), W instead where DeepSpeed drops
  it and uses its default (top level of a model section, e.g. zero_optimization.prefetch_bucket_size); E "auto" batch keys with
  accelerate (it fills the batch itself and fails DeepSpeed's assertion; recipe); E accelerate without zero_optimization.
- E batch triple: non-positive / non-integer values, none given, train_batch_size != micro x accum x world
  (world from --world-size or the launcher env, divided by sequence_parallel_size), or not divisible when one
  key is derived; W accelerate with unknown world size.
- E fp16 and bf16 both enabled; E offload_param below stage 3; E offload_optimizer at stage 0; E NVMe optimizer
  offload below stage 3; E NVMe offload without nvme_path; W stage3_* keys below stage 3; W stage 3 for the
  HF Trainer/accelerate without stage3_gather_16bit_weights_on_model_save (saved weights would be empty);
  W optimizer offload + client optimizer under plain deepspeed (ZeRORuntimeException unless DeepSpeedCPUAdam).
- E optimizer/scheduler type DeepSpeed cannot build; W section without type; E max_grad_norm in optimizer params;
  E warmup_num_steps <= 0; E total_num_steps < warmup_num_steps; E data_types.*_dtype not a DeepSpeed dtype.
- E NaN/Infinity anywhere; E duplicate keys (CLI); E DeepSpeed's own DeepSpeedConfig parse fails at the world size.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning"]
Target = Literal["deepspeed", "hf-trainer", "accelerate"]
ROOT = "<config>"
"""Key path used for problems about the config as a whole."""
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass(frozen=True)
class Problem:
    """One finding: where (key path), what was found, why it is wrong, and what to do."""

    severity: Severity
    path: str
    value: Any
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        found = f" (found {_show(self.value)})"
        fix = f"\n    fix: {self.fix}" if self.fix else ""
        return f"{self.severity}: {self.path}{found}: {self.message}{fix}"


@dataclass(frozen=True)
class LintContext:
    """What the linter cannot read from the config itself."""

    world_size: int | None = None
    """Data-parallel ranks the config will run at (None: unknown, batch checks that need it are skipped)."""
    world_size_source: str = "--world-size"
    """Where the world size came from, named in messages (a flag or an environment variable)."""
    target: Target = "deepspeed"
    """Who consumes the config: plain deepspeed.initialize, the HF Trainer, or accelerate launch."""


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else _json_like(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_like(value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        return repr(value)


def join(path: str, key: Any) -> str:
    """Dotted key path; list items and odd keys (empty, dots, spaces) in brackets: a.b[0]["x y"]."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_\-]+", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def did_you_mean(key: Any, choices: Any) -> str:
    """A "did you mean" fix for an unknown key, or a list of the valid ones."""
    choices = sorted({c for c in choices if isinstance(c, str)})
    match = difflib.get_close_matches(str(key), choices, n=1, cutoff=0.6)
    if match:
        return f"did you mean {match[0]!r}?"
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    return f"remove it, or use one of: {shown}"


def lookup(config: Any, path: str, default: Any = None) -> Any:
    """`config["a"]["b"]` for "a.b", or `default` when any level is missing or not a dict."""
    node = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def lint(config: Any, context: LintContext | None = None) -> list[Problem]:
    """Every problem in `config` (a parsed DeepSpeed JSON), errors and warnings, in one list."""
    from zero_kit import ds_schema

    context = context or LintContext()
    if not isinstance(config, dict):
        kind = type(config).__name__
        return [
            Problem(
                "error",
                ROOT,
                config,
                f"a DeepSpeed config is a JSON object, not a {kind}",
                "wrap the settings in {...}",
            )
        ]
    problems, autos, dropped = ds_schema.check_schema(config)
    problems += _auto_rules(autos, dropped, context.target)
    problems += _non_finite(config, "")
    batch_problems, world_size = _batch_rules(config, context)
    problems += batch_problems
    problems += _precision_rules(config)
    problems += _zero_rules(config, context.target)
    problems += _scheduler_rules(config)
    problems += _dtype_rules(config)
    problems = _dedupe(problems)
    if not any(p.severity == "error" for p in problems):
        problems += ds_schema.check_with_deepspeed(config, world_size, autos)
    return problems


def _dedupe(problems: list[Problem]) -> list[Problem]:
    """One problem per (path, message); the first rule to speak about a path wins over DeepSpeed's echo."""
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _auto_rules(autos: list[str], dropped: dict[str, Any], target: Target) -> list[Problem]:
    """ "auto" is a placeholder that only the HF Trainer (and accelerate) fill, and only at certain keys."""
    from zero_kit.ds_schema import hf_trainer_auto_keys

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


def _non_finite(node: Any, path: str) -> list[Problem]:
    """NaN and Infinity parse in Python but are not JSON and never a sensible setting."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _non_finite(v, join(path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _non_finite(v, join(path, i))]
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


def _batch_rules(config: dict, context: LintContext) -> tuple[list[Problem], int]:
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


def _precision_rules(config: dict) -> list[Problem]:
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


def _zero_rules(config: dict, target: Target) -> list[Problem]:
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


def _scheduler_rules(config: dict) -> list[Problem]:
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


def _dtype_rules(config: dict) -> list[Problem]:
    """data_types.*_dtype are resolved only when the engine starts (DtypeEnum), so DeepSpeed's parse accepts typos."""
    from zero_kit.ds_schema import discover, dtype_names

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
