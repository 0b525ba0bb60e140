"""The zero_optimization rules: offload and stage combinations DeepSpeed accepts silently but that do not do
what the user meant, and the stage-3 save setting the HF Trainer and accelerate need."""

from __future__ import annotations

from typing import Any

from zero_kit.lint.problem import Problem, Target, lookup


def _device(config: dict, which: str) -> Any:
    return lookup(config, f"zero_optimization.{which}.device")


def zero_rules(config: dict, target: Target, device: str | None = None) -> list[Problem]:
    """Offload and stage combinations DeepSpeed accepts silently but that do not do what the user meant, and
    stage-3 settings that fail on the run's `device` (None: unknown, not judged)."""
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
    problems = _offload_rules(config, stage)
    problems += _stage3_rules(zero, stage, target)
    if stage == 3 and device == "cpu":
        problems += _stage3_cpu_rules(zero)
    return problems


def _stage3_cpu_rules(zero: dict) -> list[Problem]:
    """ZeRO-3 settings DeepSpeed accepts on CPU ranks and then fails on."""
    threshold = zero.get("stage3_module_granularity_threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold <= 0:
        return []
    return [
        Problem(
            "error",
            "zero_optimization.stage3_module_granularity_threshold",
            threshold,
            "fails on CPU ranks at the first optimizer step: the fetched-as-one modules keep their gradients until"
            " zero_grad, which calls record_stream on them (stage3.py), and a CPU tensor has no stream"
            " ('RuntimeError: unknown parameter type')",
            "set it to 0 (DeepSpeed's default) for a CPU run; keep it for the GPU cluster",
        )
    ]


def _offload_rules(config: dict, stage: int | None) -> list[Problem]:
    """Offload devices the stage cannot use, and NVMe offload without a path."""
    problems: list[Problem] = []
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
    return problems


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
