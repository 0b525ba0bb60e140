"""The generator's checks about the flags themselves: number ranges, flags that need or exclude each other, and
values no key can hold. Every rule about what DeepSpeed does with the written keys lives in `zero_kit.lint` (the
generator runs it on its output, see `rulebook`); nothing here is a DeepSpeed rule written a second time."""

from __future__ import annotations

import math

from zero_kit.config.spec import ZeroSpec
from zero_kit.config.zeropp import hpz_enabled, hpz_partition_size
from zero_kit.errors import UserError


def number_problems(spec: ZeroSpec) -> list[UserError]:
    """Counts must be positive integers, rates finite, the stage 0-3, before any arithmetic uses them."""
    counts = {
        "--micro-batch": spec.micro_batch,
        "--grad-accum": spec.grad_accum,
        "--global-batch": spec.global_batch,
        "--world-size": spec.world_size,
        "--nodes": spec.nodes,
        "--gpus-per-node": spec.gpus_per_node,
        "--hidden-size": spec.hidden_size,
        "--tp": spec.tp,
        "--sp": spec.sp,
    }
    problems = [
        UserError(f"{flag} must be a positive integer, got {value}", f"pass {flag} 1 or more, or leave it out")
        for flag, value in counts.items()
        if value is not None and value < 1
    ]
    for flag, value in (("--lr", spec.lr), ("--weight-decay", spec.weight_decay)):
        if not math.isfinite(value) or value < 0:
            problems.append(
                UserError(f"{flag} must be a finite number >= 0, got {value}", f"pass a value such as {flag} 0.01")
            )
    if not math.isfinite(spec.gradient_clipping) or spec.gradient_clipping < 0:
        problems.append(
            UserError(
                f"--gradient-clipping must be a finite number >= 0, got {spec.gradient_clipping}",
                "pass --gradient-clipping 1.0, or 0 to disable clipping",
            )
        )
    if spec.stage not in (0, 1, 2, 3):
        problems.append(UserError(f"--stage must be 0, 1, 2 or 3, got {spec.stage}", "pick a ZeRO stage from 0 to 3"))
    return problems


def flag_problems(spec: ZeroSpec) -> list[UserError]:
    """Flags that need or exclude each other, or that no key can express (the rules the linter cannot see)."""
    problems = []
    if spec.nvme_path and "nvme" not in (spec.offload_optimizer, spec.offload_param):
        problems.append(
            UserError(
                "--nvme-path is only used with --offload-optimizer nvme or --offload-param nvme",
                "drop --nvme-path, or choose nvme offload",
            )
        )
    problems += _hpz_size_problems(spec)
    if spec.torch_autocast and spec.precision == "fp16":
        problems.append(
            UserError(
                "--torch-autocast with --precision fp16: zero-kit writes bf16 autocast only (DeepSpeed's fp16 loss"
                " scaler would run beside autocast's own GradScaler)",
                "use --precision bf16 (bf16 weights) or fp32 (torch AMP over fp32 weights)",
            )
        )
    wanted = [f for f, on in (("--bf16-master-weights", spec.bf16_master_weights),
                              ("--bf16-optimizer-states", spec.bf16_optimizer_states)) if on]  # fmt: skip
    if wanted and spec.precision != "bf16":
        # The keys go into the bf16 section, which --precision fp16/fp32 disables: DeepSpeed would ignore them.
        problems.append(
            UserError(
                f"{' and '.join(wanted)} {'keep' if len(wanted) > 1 else 'keeps'} training state in bf16 and"
                f" {'need' if len(wanted) > 1 else 'needs'} --precision bf16 (got {spec.precision})",
                f"pass --precision bf16, or drop {' and '.join(wanted)}",
            )
        )
    return problems


def _hpz_size_problems(spec: ZeroSpec) -> list[UserError]:
    """--hpz without a size the flags can give, or a size that turns hpZ off."""
    if not hpz_enabled(spec):
        return []
    size = hpz_partition_size(spec)
    if size is None:
        return [
            UserError(
                "--hpz needs a partition size: it defaults to --gpus-per-node only when --nodes > 1",
                "pass --nodes N --gpus-per-node G (multi-node), or --hpz-partition-size N",
            )
        ]
    if size < 2:
        return [
            UserError(
                f"--hpz-partition-size must be at least 2, got {size} (1 is plain ZeRO-3: no secondary shard)",
                "pass the GPUs per node, e.g. --hpz-partition-size 8, or drop --hpz-partition-size",
            )
        ]
    return []
