"""ZeRO++ (hpZ, qwZ, qgZ) and DeepSpeed's low-precision state options: what the generator refuses and the keys it
writes. Pure, like the builder; every rule names the DeepSpeed 0.19 code that makes it one.

Where a feature cannot work:
- hpZ, qwZ, qgZ act on ZeRO-3's parameter partitioning only (partition_parameters.py, stage3.py); at stage 0-2
  DeepSpeed ignores them, so asking for them there is refused.
- hpZ: DeepSpeed builds the secondary groups from consecutive ranks and asserts that the partition size divides the
  world size (utils/groups.py `_create_zero_param_parallel_group`). A size that does not divide --gpus-per-node puts
  a secondary shard across nodes, which runs but defeats hpZ's point (node-local all-gathers): refused here, a
  warning in the linter.
- qwZ/qgZ run DeepSpeed's quantizer kernels, a CUDA op build (QuantizerBuilder); on CPU the first step fails with
  "This op had not been implemented on CPU backend". The generator refuses them only when the user says the target
  is CPU (--device cpu). It never guesses the target from the machine it runs on: writing a GPU cluster's config
  on a laptop is the ordinary case. Runs decide from their real device: `zero-kit train` on CPU refuses a
  --ds-config with them (the linter's device rule).
- torch autocast with qwZ: DeepSpeed asserts "Cannot enable both torch autocast and zero quantized weights"
  (runtime/torch_autocast.py).
- bf16_optimizer_states needs bf16_master_weights_and_grads, both need stage >= 1 (runtime/config.py
  `_do_error_check`); bf16 master weights with fp32 optimizer states need optimizer offload with DeepSpeedCPUAdam
  (base_optimizer.py `_configure_master_weights`, stage3/stage_1_and_2 `_enforce_*offload`).
"""

from __future__ import annotations

from typing import Any

from zero_kit.config.spec import ZeroSpec
from zero_kit.errors import UserError

AUTOCAST_DTYPE = "bfloat16"


def hpz_enabled(spec: ZeroSpec) -> bool:
    return spec.hpz or spec.hpz_partition_size is not None


def hpz_partition_size(spec: ZeroSpec) -> int | None:
    """The hpZ partition size: --hpz-partition-size, else the GPUs per node of a multi-node run; None if unknown."""
    if spec.hpz_partition_size is not None:
        return spec.hpz_partition_size
    if (spec.nodes or 1) > 1 and spec.gpus_per_node is not None:
        return spec.gpus_per_node
    return None


def zeropp_problems(spec: ZeroSpec, world_size: int | None) -> list[UserError]:
    """Every ZeRO++ and low-precision-state flag that cannot do what it says, each with its fix."""
    problems = _stage_problems(spec) + _hpz_problems(spec, world_size)
    quantized = [flag for flag, on in _quantized_flags(spec) if on]
    if quantized and spec.device == "cpu":
        problems.append(
            UserError(
                f"{' and '.join(quantized)} {_need(quantized)} CUDA: DeepSpeed's quantizer kernels are a CUDA op build, on CPU the"
                " first step fails with 'This op had not been implemented on CPU backend'",
                f"drop {' and '.join(quantized)} for a CPU run, or generate for GPUs (--device cuda)",
            )
        )
    if spec.torch_autocast and spec.quantized_weights:
        problems.append(
            UserError(
                "--torch-autocast with --quantized-weights: DeepSpeed asserts 'Cannot enable both torch autocast and"
                " zero quantized weights' in deepspeed.initialize",
                "drop one of --torch-autocast and --quantized-weights",
            )
        )
    if spec.torch_autocast and spec.precision == "fp16":
        problems.append(
            UserError(
                "--torch-autocast with --precision fp16: zero-kit writes bf16 autocast only (DeepSpeed's fp16 loss"
                " scaler would run beside autocast's own GradScaler)",
                "use --precision bf16 (bf16 weights) or fp32 (torch AMP over fp32 weights)",
            )
        )
    return problems + _low_precision_problems(spec)


def _need(flags: list[str]) -> str:
    return "need" if len(flags) > 1 else "needs"


def _hpz_flag(spec: ZeroSpec) -> str:
    return "--hpz" if spec.hpz_partition_size is None else f"--hpz-partition-size {spec.hpz_partition_size}"


def _quantized_flags(spec: ZeroSpec) -> list[tuple[str, bool]]:
    return [("--quantized-weights", spec.quantized_weights), ("--quantized-gradients", spec.quantized_gradients)]


def _stage_problems(spec: ZeroSpec) -> list[UserError]:
    if spec.stage == 3:
        return []
    wanted = [flag for flag, on in [(_hpz_flag(spec), hpz_enabled(spec)), *_quantized_flags(spec)] if on]
    if not wanted:
        return []
    return [
        UserError(
            f"{', '.join(wanted)} {_need(wanted)} --stage 3 (got --stage {spec.stage}): ZeRO++ works on ZeRO-3's parameter"
            " partitioning, DeepSpeed ignores it at lower stages",
            f"use --stage 3, or drop {', '.join(wanted)}",
        )
    ]


def _hpz_problems(spec: ZeroSpec, world_size: int | None) -> list[UserError]:
    if not hpz_enabled(spec) or spec.stage != 3:
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
    problems = []
    if world_size is not None and world_size % size:
        problems.append(
            UserError(
                f"--hpz-partition-size {size} does not divide the world size {world_size}: DeepSpeed asserts it"
                " (secondary groups are consecutive ranks)",
                f"use a partition size that divides {world_size}, normally --gpus-per-node",
            )
        )
    gpus = spec.gpus_per_node
    if gpus is not None and gpus % size:
        problems.append(
            UserError(
                f"--hpz-partition-size {size} does not divide --gpus-per-node {gpus}: a secondary shard would span"
                " nodes, and hpZ exists to keep parameter all-gathers inside a node",
                f"use --hpz-partition-size {gpus} (or a divisor of it)",
            )
        )
    return problems


def _low_precision_problems(spec: ZeroSpec) -> list[UserError]:
    problems = []
    wanted = [f for f, on in (("--bf16-master-weights", spec.bf16_master_weights),
                              ("--bf16-optimizer-states", spec.bf16_optimizer_states)) if on]  # fmt: skip
    if wanted and spec.stage == 0:
        problems.append(
            UserError(
                f"{' and '.join(wanted)} {_need(wanted)} ZeRO stage 1, 2 or 3 (DeepSpeed asserts it)",
                f"use --stage 1, 2 or 3, or drop {' and '.join(wanted)}",
            )
        )
    if wanted and spec.precision != "bf16":
        problems.append(
            UserError(
                f"{' and '.join(wanted)} {'keep' if len(wanted) > 1 else 'keeps'} training state in bf16 and"
                f" {_need(wanted)} --precision bf16 (got {spec.precision})",
                f"pass --precision bf16, or drop {' and '.join(wanted)}",
            )
        )
    if spec.bf16_optimizer_states and not spec.bf16_master_weights:
        problems.append(
            UserError(
                "--bf16-optimizer-states needs --bf16-master-weights (DeepSpeed asserts it)",
                "add --bf16-master-weights",
            )
        )
    if spec.bf16_master_weights and not spec.bf16_optimizer_states and spec.offload_optimizer == "none":
        problems.append(
            UserError(
                "--bf16-master-weights with fp32 optimizer states needs optimizer offload: DeepSpeed asserts"
                " 'Master weights feature requires ZeRO Offload with DeepSpeedCPUAdam'",
                "add --bf16-optimizer-states (states in bf16 on the GPU), or --offload-optimizer cpu",
            )
        )
    return problems


def zeropp_zero_keys(spec: ZeroSpec) -> dict[str, Any]:
    """The zero_optimization keys for hpZ/qwZ/qgZ (none when off)."""
    keys: dict[str, Any] = {}
    if hpz_enabled(spec):
        keys["zero_hpz_partition_size"] = hpz_partition_size(spec)
    if spec.quantized_weights:
        keys["zero_quantized_weights"] = True
    if spec.quantized_gradients:
        keys["zero_quantized_gradients"] = True
    return keys


def low_precision_sections(spec: ZeroSpec) -> dict[str, Any]:
    """Additions to the bf16 section and the torch_autocast section (empty when off)."""
    bf16: dict[str, Any] = {}
    if spec.bf16_master_weights:
        bf16["bf16_master_weights_and_grads"] = True
    if spec.bf16_optimizer_states:
        bf16["bf16_optimizer_states"] = True
    sections: dict[str, Any] = {"bf16": bf16} if bf16 else {}
    if spec.torch_autocast:
        sections["torch_autocast"] = {"enabled": True, "dtype": AUTOCAST_DTYPE}
    return sections
